"""Test worker: after a line on stdin, N times each: fsync, fdatasync and
sync_file_range on a file in DIR (after a small write), then prints "done" and
blocks on stdin. argv: TAG DIR N."""
import ctypes
import os
import sys

_, tag, folder, n = sys.argv
libc = ctypes.CDLL(None, use_errno=True)
SYNC_FILE_RANGE_WRITE = 2
fd = os.open(os.path.join(folder, f"{tag}.dat"), os.O_RDWR | os.O_CREAT, 0o600)
sys.stdin.readline()
for _ in range(int(n)):
    os.pwrite(fd, b"x", 0)
    os.fsync(fd)
    os.fdatasync(fd)
    if libc.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), SYNC_FILE_RANGE_WRITE) != 0:
        raise OSError(ctypes.get_errno(), "sync_file_range")
print("done", flush=True)
sys.stdin.readline()
