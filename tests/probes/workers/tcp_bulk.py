"""Test worker for TCP: `sink TAG` listens on 0.0.0.0 (run it inside a network
namespace), prints its port and discards whatever arrives until the peer closes. `send TAG HOST PORT`
waits for a line "SECONDS PAUSE" on stdin, then sends 16 KiB chunks on one
connection for SECONDS, pausing PAUSE seconds after each (0: as fast as the link
takes them), then waits until all of it is acknowledged, sampling the kernel's own srtt of that socket (TCP_INFO,
tcpi_rtt in µs) every 5 ms from a second thread, and prints the samples as JSON; repeats per line."""
import fcntl
import json
import socket
import struct
import sys
import termios
import time

role, tag = sys.argv[1], sys.argv[2]

if role == "sink":
    listener = socket.create_server(("0.0.0.0", 0))
    print(listener.getsockname()[1], flush=True)
    import threading

    def drain(conn):
        while conn.recv(1 << 20):
            pass
        conn.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()
else:
    import threading
    host, port = sys.argv[3], int(sys.argv[4])
    chunk = b"x" * 16384

    def sample_srtt(conn, samples, stop):
        while not stop.wait(0.005):
            info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 144)
            samples.append(struct.unpack_from("I", info, 68)[0])   # tcpi_rtt

    for line in sys.stdin:
        seconds, pause = map(float, line.split())
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)   # drains in < 1 s at 10 Mbit/s
        conn.connect((host, port))
        samples, stop = [], threading.Event()
        sampler = threading.Thread(target=sample_srtt, args=(conn, samples, stop))
        sampler.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(chunk)
            if pause:
                time.sleep(pause)
        while fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4) != b"\0" * 4:
            time.sleep(0.005)                      # until everything sent is acknowledged
        stop.set()
        sampler.join()
        conn.shutdown(socket.SHUT_WR)              # our FIN, then the sink's: the connection has
        while conn.recv(4096):                     # closed (TIME_WAIT) before the samples are printed,
            pass                                   # so its close is in the interval the test reads
        conn.close()
        print(json.dumps(samples), flush=True)
