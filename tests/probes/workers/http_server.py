"""Test worker: threaded HTTP/1.1 server whose handler sleeps SLEEP_S before
answering; prints its port when ready. argv: TAG SLEEP_S. SLEEP_S `held`:
GET /held waits instead until the line "release" on stdin (printing "held" as
it starts to wait), anything else is answered at once."""
import http.server
import sys
import threading
import time

_, tag, sleep_s = sys.argv
released = threading.Event()
said = threading.Lock()   # one line at a time from the handlers' threads


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if sleep_s != "held":
            time.sleep(float(sleep_s))
        elif self.path == "/held":
            with said:
                print("held", flush=True)
            released.wait()
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def wait_for_release():
    for line in sys.stdin:
        if line.strip() == "release":
            released.set()


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
if sleep_s == "held":
    threading.Thread(target=wait_for_release, daemon=True).start()
print(server.server_address[1], flush=True)
server.serve_forever()
