"""Record the first flight (the ClientHello) real TLS clients send, as test data for gate/tls.py.

    python tests/capture_first_flight.py [OUTPUT_DIR]      # default tests/testdata/first-flight

A listener on 127.0.0.1 keeps whatever a client sends in its first few seconds and then closes; each client
is pointed at it under a made-up name (resolved to 127.0.0.1 by the client's own override), so the hello
carries that name as its SNI. The handshake never completes: nothing but the hello is needed. Clients:
Python's ssl, curl, node's https.get, git ls-remote over https. Each file is named CLIENT.bin; a missing
client is reported and skipped.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

SERVER_NAME = "first-flight.example"
DEFAULT_OUTPUT = Path(__file__).parent / "testdata" / "first-flight"
LISTEN_SECONDS = 10.0
QUIET_SECONDS = 1.0  # the hello is complete once the client has sent nothing for this long


def capture(run_client: list[str] | None, python_client: bool = False) -> bytes:
    """Start a one-connection listener, run the client against it, and return the bytes it sent."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(LISTEN_SECONDS)
        port = server.getsockname()[1]
        received: list[bytes] = []

        def accept() -> None:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(QUIET_SECONDS)
                try:
                    while chunk := conn.recv(65536):
                        received.append(chunk)
                except TimeoutError:
                    pass

        listener = threading.Thread(target=accept)
        listener.start()
        if python_client:
            _python_hello(port)
        else:
            assert run_client is not None
            command = [part.replace("{port}", str(port)) for part in run_client]
            subprocess.run(command, capture_output=True, timeout=LISTEN_SECONDS * 2, check=False,
                           env={"PATH": "/usr/bin:/bin", "GIT_TERMINAL_PROMPT": "0", "HOME": "/nonexistent"})
        listener.join(LISTEN_SECONDS * 2)
    return b"".join(received)


def _python_hello(port: int) -> None:
    context = ssl.create_default_context()
    try:
        with socket.create_connection(("127.0.0.1", port), LISTEN_SECONDS) as raw, \
                context.wrap_socket(raw, server_hostname=SERVER_NAME):
            pass
    except OSError:
        pass  # the listener closes without answering


NODE = ("const https = require('https');"
        "https.get({host: '127.0.0.1', port: Number(process.argv[1]), servername: process.argv[2], path: '/'})"
        ".on('error', () => {});")
CLIENTS: dict[str, list[str] | None] = {
    "python-ssl": None,
    "curl": ["curl", "-s", "-m", "5", "--resolve", f"{SERVER_NAME}:{{port}}:127.0.0.1",
             f"https://{SERVER_NAME}:{{port}}/"],
    "node": ["node", "-e", NODE, "{port}", SERVER_NAME],
    "git": ["git", "-c", "http.connectTimeout=5", "-c", "http.lowSpeedTime=3", "-c", "http.lowSpeedLimit=1",
            "-c", f"http.curloptResolve={SERVER_NAME}:{{port}}:127.0.0.1",
            "ls-remote", f"https://{SERVER_NAME}:{{port}}/repo.git"],
}


def main() -> int:
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    output.mkdir(parents=True, exist_ok=True)
    missing = 0
    for name, command in CLIENTS.items():
        if command is not None and shutil.which(command[0]) is None:
            print(f"{name}: {command[0]} not installed, skipped", file=sys.stderr)
            missing += 1
            continue
        data = capture(command, python_client=command is None)
        if not data:
            print(f"{name}: sent nothing", file=sys.stderr)
            missing += 1
            continue
        (output / f"{name}.bin").write_bytes(data)
        print(f"{name}: {len(data)} bytes")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
