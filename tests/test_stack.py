"""`inboxcrm up` on a busy machine: a port in use is one clear line, not a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from inboxcrm.stack.processes import free_port


def test_port_in_use_is_a_clear_message(database_url: str, tmp_path: object) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = dict(os.environ, DATABASE_URL=database_url,
                   INBOXCRM_TEMPORAL_PORT=str(port),
                   INBOXCRM_TEMPORAL_UI_PORT=str(free_port()),
                   INBOXCRM_RELAY_PORT=str(free_port()),
                   INBOXCRM_SANDBOX_PORT=str(free_port()))
        env.pop("TEMPORAL_ADDRESS", None)
        result = subprocess.run([sys.executable, "-m", "inboxcrm.cli", "up"], env=env,
                                capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert f"port {port}" in result.stderr and "INBOXCRM_TEMPORAL_PORT" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
