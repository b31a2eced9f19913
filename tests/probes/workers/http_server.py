"""Test worker: threaded HTTP/1.1 server whose handler sleeps SLEEP_S before
answering; prints its port when ready. argv: TAG SLEEP_S."""
import http.server
import sys
import time

_, tag, sleep_s = sys.argv


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        time.sleep(float(sleep_s))
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
