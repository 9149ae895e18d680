"""Screens and coordinate spaces, as plain values the backends fill in.

Physical coordinates are the desktop's own: one plane that holds every monitor,
whose origins may be negative (a monitor left of or above the primary one). A
screenshot has a space of its own — its top-left is (0, 0), and a downscaled one
is smaller than what it shows — and a point in it maps back through the
screenshot's origin and scale. A screenshot taken before the monitors changed
no longer describes the screen, so its space is refused (`out_of_bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.errors import WorkerError


@dataclass(frozen=True)
class Rect:
    x: int
    y: int
    width: int
    height: int

    @property
    def right(self) -> int:
        return self.x + self.width

    @property
    def bottom(self) -> int:
        return self.y + self.height

    def contains(self, x: int, y: int) -> bool:
        return self.x <= x < self.right and self.y <= y < self.bottom

    def intersect(self, other: Rect) -> Rect | None:
        x, y = max(self.x, other.x), max(self.y, other.y)
        right, bottom = min(self.right, other.right), min(self.bottom, other.bottom)
        if right <= x or bottom <= y:
            return None
        return Rect(x, y, right - x, bottom - y)


@dataclass(frozen=True)
class Monitor:
    rect: Rect
    primary: bool = False
    name: str = ""
    scale: float = 1.0  # the platform's UI scale factor (HiDPI), 1.0 where unknown


@dataclass(frozen=True)
class Layout:
    """The monitors as the display server describes them now."""

    monitors: tuple[Monitor, ...]
    server: str  # "x11", "quartz", "win32"

    @property
    def bounds(self) -> Rect:
        xs = [m.rect.x for m in self.monitors]
        ys = [m.rect.y for m in self.monitors]
        right = max(m.rect.right for m in self.monitors)
        bottom = max(m.rect.bottom for m in self.monitors)
        return Rect(min(xs), min(ys), right - min(xs), bottom - min(ys))

    @property
    def primary_index(self) -> int:
        for index, monitor in enumerate(self.monitors):
            if monitor.primary:
                return index
        return 0

    def monitor_at(self, x: int, y: int) -> int | None:
        for index, monitor in enumerate(self.monitors):
            if monitor.rect.contains(x, y):
                return index
        return None

    def check_point(self, x: int, y: int) -> None:
        """`out_of_bounds` unless (x, y) lies on some monitor."""
        if self.monitor_at(x, y) is None:
            screens = "; ".join(
                f"{i}: {m.rect.width}x{m.rect.height} at ({m.rect.x}, {m.rect.y})"
                for i, m in enumerate(self.monitors)
            )
            raise WorkerError(
                "out_of_bounds",
                f"({x}, {y}) is on no monitor (monitors: {screens}); pick a point on one, "
                "or take a screenshot and use its coordinates with its screenshot_id",
                {"x": x, "y": y},
            )


@dataclass(frozen=True)
class ShotSpace:
    """How a screenshot's pixels map to the desktop."""

    origin: Rect  # the physical region captured
    width: int  # the image's size, after any downscale
    height: int
    layout: Layout  # the monitors when it was taken

    @property
    def scale(self) -> float:
        return self.width / self.origin.width

    def to_physical(self, x: int, y: int) -> tuple[int, int]:
        """A point of the image, mapped back onto the desktop (centre of its pixel)."""
        if not (0 <= x < self.width and 0 <= y < self.height):
            raise WorkerError(
                "out_of_bounds",
                f"({x}, {y}) is outside the screenshot, which is {self.width}x{self.height}",
                {"x": x, "y": y, "width": self.width, "height": self.height},
            )
        px = self.origin.x + min(
            self.origin.width - 1, int((x + 0.5) * self.origin.width / self.width)
        )
        py = self.origin.y + min(
            self.origin.height - 1, int((y + 0.5) * self.origin.height / self.height)
        )
        return px, py

    def from_physical(self, x: int, y: int) -> tuple[int, int] | None:
        """A desktop point in the image's space, or None when the image does not show it."""
        if not self.origin.contains(x, y):
            return None
        return (
            int((x - self.origin.x) * self.width / self.origin.width),
            int((y - self.origin.y) * self.height / self.origin.height),
        )


def fit(width: int, height: int, max_width: int | None, max_height: int | None) -> tuple[int, int]:
    """The largest size within the limits that keeps the aspect ratio (never larger)."""
    factor = 1.0
    if max_width is not None and width > max_width:
        factor = min(factor, max_width / width)
    if max_height is not None and height > max_height:
        factor = min(factor, max_height / height)
    if factor >= 1.0:
        return width, height
    return max(1, round(width * factor)), max(1, round(height * factor))
