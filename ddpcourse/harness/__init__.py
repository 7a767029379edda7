"""What a lab runs around the learner's classes, where that is too long to sit below them (labs 06 and 07).

Each ``labNN.py`` holds the lab's model, data, torch's reference runs and the ``report(...)`` its check judges,
and a ``main`` that takes the learner's classes. The lab file ends with a three-line ``__main__`` that hands
them over, so it runs as ``python labs/NN_x.py`` and under torchrun as before, and the learner opens a file
that holds only what they write. Lab-side like ddpcourse.lab: it never imports the course's tools.
"""
