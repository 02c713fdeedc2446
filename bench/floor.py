"""The floor of ``bench/run.py``: the least an agent runner can do, in one asyncio loop.

    python bench/floor.py TASKS.jsonl BASE_URL MODEL CONCURRENCY

Per episode: one keep-alive HTTP/1.1 connection to the chat server; each turn posts
the conversation, takes the ``bash`` tool call of the reply, runs it with
``bash -c`` in the task's directory, appends the output; it stops after the command
that prints ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (or 50 turns). Nothing else: no
sandbox, no retries, no parsing beyond ``json``, no files written. Standard library only.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from urllib.parse import urlsplit

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
DONE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


async def post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str, body: dict
) -> dict:
    """One POST on an open keep-alive connection; the decoded JSON reply."""
    data = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer floor\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return json.loads(await reader.readexactly(length))


async def episode(task: dict, url: str, model: str, workdir: str) -> int:
    """Run one task to its end; the number of turns."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    messages = [
        {"role": "system", "content": "You are a helpful assistant with a bash tool."},
        {"role": "user", "content": task["problem_statement"]},
    ]
    try:
        for turn in range(1, 51):
            reply = await post(
                reader,
                writer,
                parts.netloc,
                parts.path + "/chat/completions",
                {"model": model, "messages": messages, "tools": [BASH_TOOL]},
            )
            message = reply["choices"][0]["message"]
            messages.append(message)
            for call in message.get("tool_calls") or []:
                command = json.loads(call["function"]["arguments"])["command"]
                proc = await asyncio.create_subprocess_exec(
                    "bash",
                    "-c",
                    command,
                    cwd=workdir,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
                output = (await proc.communicate())[0].decode(errors="replace")
                if output.lstrip().startswith(DONE):
                    return turn
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        return 50
    finally:
        writer.close()


async def main(tasks_path: str, url: str, model: str, concurrency: int) -> None:
    """Every task of the file, ``concurrency`` at once."""
    with open(tasks_path) as handle:
        tasks = [json.loads(line) for line in handle if line.strip()]
    semaphore = asyncio.Semaphore(concurrency)
    with tempfile.TemporaryDirectory(prefix="floor-") as workdir:

        async def one(task: dict) -> int:
            async with semaphore:
                return await episode(task, url, model, workdir)

        turns = await asyncio.gather(*(one(t) for t in tasks))
    print(json.dumps({"episodes": len(turns), "turns": sum(turns)}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
