"""Take the screenshot docs/img/live-page.png: the live page during the demo's load ramp.

Runs ``spec-router demo --hold``, opens the router's live page in headless Chromium (the
system's, like tests/ui) as soon as the demo names it, and takes a full-page screenshot ``--at``
seconds into the hold's ramp (by default at 32 concurrent requests on the way up, when both
pools are busy), then stops the demo by its PID.

    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 .venv/bin/python scripts/ui_screenshot.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "live-page.png")
    p.add_argument("--hold-step", type=float, default=3.0)
    p.add_argument("--at", type=float, default=16.5, help="seconds into the hold")
    p.add_argument("--width", type=int, default=1400)
    args = p.parse_args()
    chromium = os.environ.get("SPEC_ROUTER_CHROMIUM") or shutil.which("chromium")
    if not chromium:
        print("no chromium: run scripts/ensure-chromium.sh", file=sys.stderr)
        return 1
    hold = args.at + 10
    cmd = [sys.executable, "-m", "router", "demo", "--hold", str(hold)]
    cmd += ["--hold-step", str(args.hold_step), "--plot", "/tmp/ui-screenshot-demo.png"]
    demo = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert demo.stdout is not None
    try:
        with sync_playwright() as pw:
            launch = ["--no-sandbox"] if os.geteuid() == 0 else []
            browser = pw.chromium.launch(executable_path=chromium, args=launch)
            page = browser.new_page(viewport={"width": args.width, "height": 1100})
            for line in demo.stdout:
                print(line, end="", flush=True)
                if line.startswith("live page: "):
                    page.goto(line.split()[2])
                if line.startswith("holding for"):
                    break
            time.sleep(args.at)  # a script, not a test: the ramp runs on the demo's clock
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=True)
            print(f"wrote {args.out}", file=sys.stderr)
            browser.close()
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)  # the demo stops holding and shuts its stack down
            try:
                demo.wait(timeout=30)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
        demo.stdout.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
