"""workerComputer through hub → worker → hub on a busy 1920x1080 screen, beside raw
in-process baselines measured in the same run.

The screen is an Xvfb display with a content-rich window on it (../shared/bench/
busy_screen.py when it sits beside the repository, else benchmarks/_busy_screen.py).
The reference hub runs in this process and sends each call down the stream to a real
`agentworker run` process on that display, as in bench_roundtrip.py. Rows:

  screenshot PNG    raw mss grab
                    raw grab + PNG (Pillow BGRA→RGB, zlib-ng level 1)   ← baseline
                    screenshot (PNG) hub → worker → hub
  screenshot JPEG   raw grab + Pillow JPEG q75                          ← baseline
                    screenshot (JPEG q75) hub → worker → hub
  input             raw XTEST: 100 characters typed from this process    ← baseline
                    raw XQueryPointer from this process
                    cursor_position, mouse_click, key_type of 100 characters,
                    each hub → worker → hub

Raw and worker rows alternate in rounds, so a shared machine's drift weighs on both.
Goals (issue 14): PNG ≤ 1.5x its baseline, JPEG ≤ 1.5x its baseline, cursor_position
≤ 2 ms, 100 characters ≤ 60 ms.

    python benchmarks/bench_computer.py [--calls 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import mss
from PIL import Image
from Xlib import XK, X
from Xlib import display as xdisplay
from zlib_ng import zlib_ng

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import (
    OneCall,
    agentworker,
    exited,
    goal,
    machine,
    make_home,
    percentile,
)
from tests.support.bounds import Bound, slowness
from tests.support.desktop import XServer, start_xvfb, wait_until
from worker import app
from worker.config import Paths, load
from worker.hub.server import Hub
from worker.wire.proto import agentworker_pb2 as pb

WIDTH, HEIGHT = 1920, 1080
ROUNDS = 5
TEXT = ("The quick brown fox jumps over the lazy dog, 0123456789. " * 2)[:100]
# ../shared/bench/busy_screen.py beside the repository (or named by the variable).
SHARED_BUSY_SCREEN = Path(
    os.environ.get("AGENTWORKER_BUSY_SCREEN") or ROOT.parent / "shared" / "bench" / "busy_screen.py"
)
OWN_BUSY_SCREEN = ROOT / "benchmarks" / "_busy_screen.py"
CONFIG = """
[computer]
# The raw typing baseline injects from this process: another X client, which would
# otherwise (rightly) pause the computer surface.
takeover = false
"""


# ------------------------------------------------------------------ the screen


@contextlib.contextmanager
def busy_screen() -> Iterator[XServer]:
    server = start_xvfb(WIDTH, HEIGHT, window_manager=False)
    script = SHARED_BUSY_SCREEN if SHARED_BUSY_SCREEN.exists() else OWN_BUSY_SCREEN
    argv = [sys.executable, str(script)]
    if script == OWN_BUSY_SCREEN:
        argv += [str(WIDTH), str(HEIGHT)]
    painter = subprocess.Popen(argv, env=server.env(), stderr=subprocess.DEVNULL)
    server.helpers.append(painter)
    try:
        os.environ["DISPLAY"] = server.display
        with mss.MSS() as sct:
            wait_until(lambda: _drawn(sct), 30 * slowness(), what="the busy screen to be drawn")
        print(f"screen: {WIDTH}x{HEIGHT} on Xvfb {server.display}, drawn by {script.name}")
        yield server
    finally:
        server.stop()


def _drawn(sct: mss.MSS, previous: list[bytes] = []) -> bool:  # noqa: B006 - last grab kept
    """Busy (many colours) and done (the same as the grab before)."""
    raw = bytes(sct.grab(sct.monitors[1]).raw)
    colours = len(set(raw[i : i + 3] for i in range(0, len(raw), 4 * 997)))
    done = colours > 64 and previous[-1:] == [raw]
    previous[:] = [raw]
    return done


# ------------------------------------------------------------------ raw baselines


def raw_grab(sct: mss.MSS) -> OneCall:
    region = sct.monitors[1]

    async def one() -> None:
        sct.grab(region)

    return one


def _rgb(sct: mss.MSS) -> Image.Image:
    shot = sct.grab(sct.monitors[1])
    return Image.frombuffer("RGB", shot.size, shot.raw, "raw", "BGRX", 0, 1)


def raw_png(sct: mss.MSS) -> OneCall:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    async def one() -> None:
        image = _rgb(sct)
        pixels, stride = image.tobytes(), image.width * 3
        view = memoryview(pixels)
        rows = b"".join(b"\0" + view[i : i + stride] for i in range(0, len(pixels), stride))
        header = struct.pack(">IIBBBBB", image.width, image.height, 8, 2, 0, 0, 0)
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
        png += chunk(b"IDAT", zlib_ng.compress(rows, 1)) + chunk(b"IEND", b"")
        sizes["raw png"] = len(png)

    return one


def raw_jpeg(sct: mss.MSS) -> OneCall:
    async def one() -> None:
        out = io.BytesIO()
        _rgb(sct).save(out, "JPEG", quality=75)
        sizes["raw jpeg"] = out.tell()

    return one


def raw_typing() -> OneCall:
    """100 characters through XTEST from this process: press + release each, one sync."""
    d = xdisplay.Display()
    codes = []
    for ch in TEXT:
        keycode = d.keysym_to_keycode(XK.string_to_keysym(ch) or ord(ch))
        shifted = ch.isupper()
        codes.append((keycode, shifted))
    shift = d.keysym_to_keycode(XK.XK_Shift_L)

    async def one() -> None:
        for keycode, shifted in codes:
            if shifted:
                d.xtest_fake_input(X.KeyPress, shift)
            d.xtest_fake_input(X.KeyPress, keycode)
            d.xtest_fake_input(X.KeyRelease, keycode)
            if shifted:
                d.xtest_fake_input(X.KeyRelease, shift)
        d.sync()

    return one


def raw_pointer() -> OneCall:
    """XQueryPointer through python-xlib from this process: the X server's round trip
    that cursor_position cannot do without."""
    root = xdisplay.Display().screen().root

    async def one() -> None:
        root.query_pointer()

    return one


sizes: dict[str, int] = {}


# ------------------------------------------------------------------ through the worker


inside: dict[str, list[float]] = {}


def call(
    hub: Hub, action: str, args: str, label: str = "", surface: str = "workerComputer"
) -> OneCall:
    request = pb.DispatchRequest(agent_id="bench", surface=surface, action=action, args_json=args)
    spent = inside.setdefault(label or action, [])

    async def one() -> None:
        reply = await hub.dispatch(request)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(f"{action}: {reply.result.error.message}")
        if label:
            sizes[label] = len(reply.result.blob)
        spent.append(float(reply.result.invocation.duration_ms))

    return one


@contextlib.asynccontextmanager
async def embedded_hub(path: Path) -> AsyncIterator[Hub]:
    """The reference hub in this process, and a worker process on the busy screen."""
    scopes = ["workerComputer.*", "workerHost.fs_stat"]
    home = make_home(path, mode="ro", scopes=scopes, extra_config=CONFIG)
    paths = Paths(config_dir=path, data_dir=path)
    running = await app.start_hub(paths, load(paths))
    try:
        token = paths.token_file.read_text().strip()
        with agentworker(["run", "--server", running.address, "--token", token], home) as proc:
            bound = Bound(20)  # stretched with the machine's load
            while not running.hub.sessions:
                if proc.poll() is not None:
                    raise exited(proc, home, "run", "before it connected")
                if bound.passed():
                    raise TimeoutError(f"the worker did not connect within {bound}")
                await asyncio.sleep(0.05)
            yield running.hub
    finally:
        await running.stop()


# ------------------------------------------------------------------ measuring


async def rounds(rows: list[tuple[str, OneCall]], calls: int) -> dict[str, list[float]]:
    """Each row `calls` times in all, in ROUNDS alternating rounds, after a warm-up."""
    for _name, one in rows:
        for _ in range(3):
            await one()
    samples: dict[str, list[float]] = {name: [] for name, _ in rows}
    per_round = max(1, calls // ROUNDS)
    for _ in range(ROUNDS):
        for name, one in rows:
            for _ in range(per_round):
                start = time.perf_counter()
                await one()
                samples[name].append((time.perf_counter() - start) * 1000)
    return samples


def table(title: str, samples: dict[str, list[float]], baseline: str | None) -> dict[str, float]:
    print(f"\n{title}")
    print(f"  {'':46}{'p50 ms':>9}{'p99 ms':>9}{'p50/base':>10}")
    base = statistics.median(samples[baseline]) if baseline else None
    medians = {}
    for name, lat in samples.items():
        p50 = statistics.median(lat)
        medians[name] = p50
        ratio = f"{p50 / base:10.2f}" if base else f"{'':10}"
        print(f"  {name:46}{p50:9.2f}{percentile(lat, 0.99):9.2f}{ratio}")
    return medians


async def bench(calls: int, path: Path) -> None:
    with mss.MSS() as sct:
        async with embedded_hub(path) as hub:
            png = await rounds(
                [
                    ("raw mss grab", raw_grab(sct)),
                    ("raw grab + PNG (zlib-ng level 1)", raw_png(sct)),
                    ("screenshot PNG hub → worker → hub", call(hub, "screenshot", "{}", "png")),
                ],
                calls,
            )
            jpeg = await rounds(
                [
                    ("raw grab + Pillow JPEG q75", raw_jpeg(sct)),
                    (
                        "screenshot JPEG q75 hub → worker → hub",
                        call(hub, "screenshot", '{"format": "jpeg", "quality": 75}', "jpeg"),
                    ),
                ],
                calls,
            )
            click = f'{{"x": {WIDTH // 2}, "y": {HEIGHT // 2}}}'
            typing = f'{{"text": "{TEXT}"}}'
            inputs = await rounds(
                [
                    ("raw XTEST typing, 100 characters", raw_typing()),
                    ("raw XQueryPointer (python-xlib)", raw_pointer()),
                    (
                        "fs_stat hub → worker → hub (any call's floor)",
                        call(hub, "fs_stat", '{"path": "."}', surface="workerHost"),
                    ),
                    ("cursor_position hub → worker → hub", call(hub, "cursor_position", "{}")),
                    ("mouse_click hub → worker → hub", call(hub, "mouse_click", click)),
                    ("key_type 100 characters hub → worker → hub", call(hub, "key_type", typing)),
                ],
                calls,
            )
    p = table(
        f"screenshot PNG, {WIDTH}x{HEIGHT}, {calls} calls each",
        png,
        "raw grab + PNG (zlib-ng level 1)",
    )
    j = table(f"screenshot JPEG q75, {calls} calls each", jpeg, "raw grab + Pillow JPEG q75")
    i = table(f"input, {calls} calls each", inputs, "raw XTEST typing, 100 characters")
    spent = ", ".join(f"{name} {statistics.median(ms):.0f}" for name, ms in inside.items() if ms)
    print(f"\n  inside the worker (telemetry duration_ms, p50): {spent}")
    print(
        f"  bytes: PNG {sizes.get('png', 0):,} (raw {sizes.get('raw png', 0):,}), "
        f"JPEG {sizes.get('jpeg', 0):,} (raw {sizes.get('raw jpeg', 0):,})"
    )
    png_raw = "raw grab + PNG (zlib-ng level 1)"
    goal(
        "screenshot PNG e2e / raw zlib-ng PNG",
        p["screenshot PNG hub → worker → hub"],
        " ms",
        1.5,
        baseline=p[png_raw],
        baseline_name="raw grab + PNG",
        on="ratio",
    )
    goal(
        "screenshot JPEG e2e / raw JPEG",
        j["screenshot JPEG q75 hub → worker → hub"],
        " ms",
        1.5,
        baseline=j["raw grab + Pillow JPEG q75"],
        baseline_name="raw grab + JPEG",
        on="ratio",
    )
    floor = i["fs_stat hub → worker → hub (any call's floor)"]
    goal(
        "cursor_position",
        i["cursor_position hub → worker → hub"],
        " ms",
        2,
        baseline=floor,
        baseline_name="fs_stat",
    )
    goal(
        "key_type 100 characters",
        i["key_type 100 characters hub → worker → hub"],
        " ms",
        60,
        baseline=i["raw XTEST typing, 100 characters"],
        baseline_name="raw XTEST typing",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    print(machine())
    with busy_screen(), tempfile.TemporaryDirectory() as home:
        asyncio.run(bench(args.calls, Path(home)))


if __name__ == "__main__":
    main()
