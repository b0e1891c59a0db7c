"""A real IMAP server of the test's own: Debian's Dovecot (`dovecot-imapd`) on a loopback
port, with a configuration, a passwd-file and maildirs under a temporary directory (never the
system-wide service). `doveadm` against the same configuration appends mail without an IMAP
connection, kicks sessions, changes a folder's UIDVALIDITY and counts connections."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from inboxcrm.stack.processes import free_port

DOVECOT = shutil.which("dovecot") or "/usr/sbin/dovecot"
DOVEADM = shutil.which("doveadm") or "/usr/bin/doveadm"
MISSING = ("Dovecot is not installed: `apt-get install -y dovecot-imapd` "
           "(the CI script installs it)")


def available() -> bool:
    return os.path.exists(DOVECOT) and os.path.exists(DOVEADM)


_CONFIG = """\
protocols = imap
listen = 127.0.0.1
base_dir = {root}/run
state_dir = {root}/state
instance_name = inboxcrm-test-{port}
log_path = {root}/dovecot.log
info_log_path = {root}/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login xoauth2
default_internal_user = {user}
default_internal_group = {group}
default_login_user = {user}
first_valid_uid = {uid}
mail_location = maildir:{root}/mail/%u
mail_uid = {uid}
mail_gid = {gid}
mail_plugins =
protocol imap {{
  mail_max_userip_connections = {max_userip}
  imap_idle_notify_interval = {idle_notify} secs
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service anvil {{
  chroot =
}}
service imap-login {{
  chroot =
}}
service pop3-login {{
  inet_listener pop3 {{
    port = 0
  }}
}}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/passwd
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={root}/home/%u
}}
"""


@dataclass
class Dovecot:
    """One running Dovecot; `users` maps IMAP user names to their passwords."""

    root: Path
    port: int = field(default_factory=free_port)
    users: dict[str, str] = field(default_factory=dict)
    # IMAP sessions one user may hold from one address (all of ours come from loopback):
    # a login beyond it is refused and logged, which `refused_logins` counts.
    max_userip_connections: int = 50
    # How often the server says "* OK Still here" to a session in IDLE (Dovecot's default:
    # 2 minutes). Each such line also wakes the watcher, which then reads the folder.
    idle_notify_seconds: int = 120
    process: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.root / "dovecot.conf"

    def start(self, users: dict[str, str]) -> Dovecot:
        self.users = dict(users)
        account = pwd.getpwnam("dovecot")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # the auth and mail processes run as `dovecot`
        for sub in ("run", "state", "mail", "home"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("mail", "home"):
            os.chown(self.root / sub, account.pw_uid, account.pw_gid)
        (self.root / "passwd").write_text(
            "".join(f"{name}:{{PLAIN}}{password}::::::\n" for name, password in users.items()))
        self.config.write_text(_CONFIG.format(
            root=self.root, port=self.port, user="dovecot", group="dovecot",
            uid=account.pw_uid, gid=account.pw_gid,
            max_userip=self.max_userip_connections, idle_notify=self.idle_notify_seconds))
        self.process = subprocess.Popen([DOVECOT, "-F", "-c", str(self.config)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(200).startswith(b"* OK"):
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"dovecot did not start: {self.log()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def log(self) -> str:
        path = self.root / "dovecot.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def doveadm(self, *args: str, stdin: bytes | None = None) -> str:
        done = subprocess.run([DOVEADM, "-c", str(self.config), *args], input=stdin,
                              capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"doveadm {' '.join(args)}: {done.stderr.decode()[-500:]}")
        return done.stdout.decode()

    def deliver(self, user: str, raw: bytes, folder: str = "INBOX") -> None:
        """Put a message into a folder as delivery would: no IMAP connection involved."""
        self.doveadm("save", "-u", user, "-m", folder, stdin=raw)

    def create_folder(self, user: str, folder: str) -> None:
        self.doveadm("mailbox", "create", "-u", user, folder)

    def status(self, user: str, folder: str = "INBOX") -> dict[str, int]:
        out = self.doveadm("-f", "flow", "mailbox", "status", "-u", user,
                           "messages uidvalidity uidnext", folder)
        return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", out)}

    def set_uidvalidity(self, user: str, value: int, folder: str = "INBOX") -> None:
        self.doveadm("mailbox", "update", "-u", user, "--uid-validity", str(value), folder)

    def kick(self, user: str) -> None:
        self.doveadm("kick", user)

    def connections(self, user: str) -> int:
        """How many IMAP sessions of `user` the server holds now (`doveadm who`)."""
        out = self.doveadm("-f", "tab", "who", user)
        total = 0
        for line in out.splitlines()[1:]:
            cols = line.split("\t")
            if cols and cols[0] == user:
                total += int(cols[1])
        return total

    def logins(self, user: str) -> int:
        """How many logins of `user` the server has logged since it started."""
        return len(re.findall(rf"imap-login: Info: Login: user=<{re.escape(user)}>", self.log()))

    def refused_logins(self, user: str) -> int:
        """Logins of `user` refused for `mail_max_userip_connections` since the start."""
        return len(re.findall(
            rf"Maximum number of connections from user\+IP exceeded[^\n]*user=<{re.escape(user)}>",
            self.log()))

    def move_all(self, user: str, source: str, target: str) -> None:
        """Move every message of `source` into `target` in one go: to a watcher of `target`
        a burst of new mail that arrived at once."""
        self.doveadm("move", "-u", user, target, "mailbox", source, "all")
