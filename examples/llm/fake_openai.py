"""A fake OpenAI-compatible chat completions server, for trying token limits with `tollgate proxy`.

    python3 examples/llm/fake_openai.py 3000

POST /v1/chat/completions answers "Hello from the fake upstream" with a usage that counts words
as tokens (prompt: the words of the messages' contents; completion: the reply's 5 words), as
JSON, or streamed as server-sent events with `"stream": true` (the usage in a last chunk when
`"stream_options": {"include_usage": true}`), as OpenAI's API does.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = ["Hello", " from", " the", " fake", " upstream"]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        request = json.loads(self.rfile.read(length) or b"{}")
        words = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
        usage = {"prompt_tokens": words, "completion_tokens": len(REPLY), "total_tokens": words + len(REPLY)}
        base = {"id": "chatcmpl-1", "created": 1, "model": request.get("model", "fake")}
        if not request.get("stream"):
            body = json.dumps({**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "".join(REPLY)}, "finish_reason": "stop"}
            ]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def send(data):
            event = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()

        chunk = {**base, "object": "chat.completion.chunk", "usage": None}
        for word in REPLY:
            send(json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}))
        send(json.dumps({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        if request.get("stream_options", {}).get("include_usage"):
            send(json.dumps({**chunk, "choices": [], "usage": usage}))
        send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
