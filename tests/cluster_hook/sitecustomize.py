"""What one node of the test cluster can see (tests/ray_cluster.py puts this folder on PYTHONPATH in the
environment of each node it starts, so every Python process of that node, Ray's workers included, runs this
at start-up). Nothing here is seqis: it stands in for the machine a worker runs on.

SEQIS_TEST_OPENED=FILE        (the node's environment) each file opened under SEQIS_TEST_WATCH is appended to
                              FILE, one path a line: which node read which step
SEQIS_TEST_UNREADABLE=P[:P]   (the node's environment) opening P, or a file under the folder P, fails as a file
                              without read permission does (PermissionError, errno 13, naming the file): a node
                              whose mount of the run's storage is missing or closed to it
SEQIS_TEST_NO_SEQIS=1         (a job's runtime_env) seqis is not installed here (its editable install's finder is
                              taken out): `import seqis` fails unless the job ships it (runtime_env py_modules)
"""

import builtins
import errno
import io
import os
import sys

_opened = os.environ.get("SEQIS_TEST_OPENED")
_watch = os.environ.get("SEQIS_TEST_WATCH", "/")
_unreadable = [p for p in os.environ.get("SEQIS_TEST_UNREADABLE", "").split(os.pathsep) if p]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


if _opened or _unreadable:
    _open = io.open

    def _guarded_open(file, *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(file))
            if any(_under(path, p) for p in _unreadable):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(file))
            if _opened and _under(path, _watch):
                fd = os.open(_opened, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, (path + "\n").encode())
                finally:
                    os.close(fd)
        return _open(file, *args, **kwargs)

    builtins.open = io.open = _guarded_open


if os.environ.get("SEQIS_TEST_NO_SEQIS") == "1":  # the editable install's finder taken out: seqis is not installed
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable___seqis")]
