"""Keep the agent's rendezvous store on the loopback interface.

A TCPStore server listens on every interface by default; torch lets its creator hand it a socket that is
already listening instead (``master_listen_fd``), and a later ``TCPStore(..., multi_tenant=True)`` on the
same port in the same process reuses that server. torchrun's c10d rendezvous store is created that way, so
the agent creates it first, bound to 127.0.0.1, and torch then uses it. Rank 0's store for
``init_process_group`` is left to torch (see ddpcourse.launch.rank: doing the same there made ranks abort at exit).
"""
import socket
from datetime import timedelta


def serve_store_on_loopback(port=0, timeout=timedelta(minutes=30)):
    """(store, port): a TCPStore server listening on 127.0.0.1:port only (port 0: a free one).

    Returns (None, port) when the port is taken: torch's own attempt then reports it as usual."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError:
        sock.close()
        return None, port
    port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                          master_listen_fd=sock.detach(), timeout=timeout)
    return store, port
