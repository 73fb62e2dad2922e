"""`uma service`: the daemon started at login, by systemd (Linux) or launchd (macOS).

Pure: builds the unit's text and where it goes; the CLI writes it. The systemd unit is
Type=notify, so `systemctl --user start uma` returns once the daemon answers (it sends
READY=1 after its ready line, uma.server.main.notify_systemd), and SIGTERM is how systemd
stops it, which the daemon drains like any SIGTERM.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

SYSTEMD_NAME = "uma.service"
LAUNCHD_LABEL = "dev.uma-serve.daemon"


@dataclass(frozen=True)
class Unit:
    path: Path  # where it is installed
    text: str
    enable: str  # the command that starts it now and at every login
    disable: str  # the command that stops it and keeps it from starting


def unit_for(platform: str, command: list[str]) -> Unit:
    """The unit that runs `command` at login on this platform (sys.platform)."""
    if platform == "darwin":
        return launch_agent(command)
    return systemd_unit(command)


def _config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")


def systemd_unit(command: list[str]) -> Unit:
    # The environment the daemon needs beyond systemd's: UMA_* settings and the cache
    # directory, as they are now, so the service serves what `uma run` would.
    # A key stays out of the unit file (world-readable): api_key_file in the config is the way.
    env = {k: v for k, v in os.environ.items()
           if (k.startswith("UMA_") and k != "UMA_API_KEY") or k == "XDG_CACHE_HOME"}
    lines = [
        "[Unit]",
        "Description=UMA Serve: one local LLM daemon for every app",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={' '.join(_systemd_quote(arg) for arg in command)}",
        *(f"Environment={_systemd_quote(f'{k}={v}')}" for k, v in sorted(env.items())),
        "Restart=on-failure",
        "RestartSec=5",
        # Loading a large model and timing the device can take a while on a CPU.
        "TimeoutStartSec=600",
        "TimeoutStopSec=60",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    path = _config_home() / "systemd" / "user" / SYSTEMD_NAME
    return Unit(path, "\n".join(lines),
                enable=f"systemctl --user daemon-reload && systemctl --user enable --now "
                       f"{SYSTEMD_NAME}",
                disable=f"systemctl --user disable --now {SYSTEMD_NAME}")


def _systemd_quote(arg: str) -> str:
    """One ExecStart= / Environment= word: systemd splits on spaces and reads quotes and
    backslashes, and expands % specifiers."""
    arg = arg.replace("%", "%%")
    if arg and not any(c in arg for c in " \t\"'\\;$"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def launch_agent(command: list[str]) -> Unit:
    args = "\n".join(f"    <string>{escape(arg)}</string>" for arg in command)
    log = Path.home() / "Library" / "Logs" / "uma-serve.log"
    text = f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>{LAUNCHD_LABEL}</string>
  <key>ProgramArguments</key>
  <array>
{args}
  </array>
  <key>RunAtLoad</key>
  <true/>
  <key>KeepAlive</key>
  <dict>
    <key>SuccessfulExit</key>
    <false/>
  </dict>
  <key>StandardErrorPath</key>
  <string>{escape(str(log))}</string>
</dict>
</plist>
"""
    path = Path.home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
    quoted = shlex.quote(str(path))
    return Unit(path, text, enable=f"launchctl load -w {quoted}",
                disable=f"launchctl unload -w {quoted}")
