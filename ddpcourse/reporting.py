"""Results a lab hands back to the launcher: ``report(name=value, ...)``.

Introduced in notebooks/00_start_here.ipynb. A lab calls ``report`` on any rank; the launcher
(ddpcourse.launch.launcher) returns the values per rank, so a notebook cell asserts on data instead of
parsing printed text. Outside the launcher (``python lab.py`` or a plain torchrun) it does nothing.

This module never imports torch: the launcher process imports it too.
"""
from ddpcourse.launch.events import REPORT, write_event


def _plain(value):
    """Turn tensors, numpy arrays and containers of them into JSON-friendly Python values."""
    if hasattr(value, "detach"):  # a torch tensor, possibly on a GPU
        value = value.detach().cpu()
    if hasattr(value, "tolist"):  # tensors and numpy arrays/scalars
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def report(**values):
    """Hand named results back to the notebook cell or check that launched this script.

    Example: ``report(mean=mean, weights=model.state_dict())``. Tensors become nested lists.
    Calling it again with the same name replaces the earlier value.
    """
    write_event(REPORT, values={k: _plain(v) for k, v in values.items()})
