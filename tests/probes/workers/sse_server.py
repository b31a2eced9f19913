"""Test worker: a FastAPI app under uvicorn that streams server-sent events the
way an OpenAI-style LLM server does (one `data:` event per token, then
`data: [DONE]`), and fails on purpose; prints its port when ready.
argv: TAG ADDRESS (to listen on).
GET /stream?tokens=N&first=S&gap=S waits S (prefill) before the first event and
S between events; /missing is a 404, /broken raises (500), /busy is a 503,
/json a plain JSON answer (uvicorn writes its headers and body separately)."""
import asyncio
import socket
import sys

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse

app = FastAPI()


@app.get("/stream")
async def stream(tokens: int, first: float, gap: float):
    async def events():
        await asyncio.sleep(first)
        for i in range(tokens):
            if i:
                await asyncio.sleep(gap)
            yield f'data: {{"token": {i}}}\n\n'
        yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")


@app.get("/json")
async def json_answer():
    return {"ok": True}


@app.get("/missing")
async def missing():
    raise HTTPException(status_code=404, detail="no such model")


@app.get("/busy")
async def busy():
    raise HTTPException(status_code=503, detail="overloaded")


@app.get("/broken")
async def broken():
    raise RuntimeError("failed on purpose")


if __name__ == "__main__":
    sock = socket.socket()
    sock.bind((sys.argv[2], 0))
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="critical", access_log=False)).run(sockets=[sock])
