"""A content-rich screen for the screenshot benchmark, when ../shared/bench/busy_screen.py
is not beside the repository: a dark toolbar, a sidebar, lines of text, coloured
buttons and a block of random colours, drawn full screen by Tk.

    DISPLAY=:N python benchmarks/_busy_screen.py WIDTH HEIGHT
"""

from __future__ import annotations

import random
import sys
import tkinter as tk

WORDS = [
    "open",
    "save",
    "close",
    "window",
    "panel",
    "agent",
    "worker",
    "screen",
    "pixel",
    "button",
    "menu",
    "view",
    "edit",
    "search",
    "status",
    "report",
    "plan",
    "action",
    "result",
    "blob",
    "scope",
    "grant",
    "pause",
    "resume",
]


def main() -> None:
    width, height = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(7)
    root = tk.Tk()
    root.geometry(f"{width}x{height}+0+0")
    root.overrideredirect(True)
    canvas = tk.Canvas(root, width=width, height=height, bg="#fafafa", highlightthickness=0)
    canvas.pack()
    canvas.create_rectangle(0, 0, width, 44, fill="#23262b", outline="")
    for i in range(14):
        canvas.create_text(24 + i * 100, 22, text=rng.choice(WORDS), fill="#e8e8e8", anchor="w")
    canvas.create_rectangle(0, 44, 240, height, fill="#eceff3", outline="")
    for y in range(64, height, 24):
        canvas.create_text(14, y, text=" ".join(rng.choices(WORDS, k=2)), anchor="w")
    for y in range(64, height, 17):
        line = " ".join(rng.choices(WORDS, k=rng.randint(5, 16)))
        canvas.create_text(260, y, text=line, anchor="w", font=("Courier", 10))
    palette = ["#3b82f6", "#ef4444", "#22c55e", "#eab308", "#a855f7"]
    for _ in range(48):
        x, y = rng.randint(width * 5 // 8, width - 90), rng.randint(60, height - 40)
        canvas.create_rectangle(x, y, x + 72, y + 26, fill=rng.choice(palette), outline="")
    for i in range(24 * 14):
        x, y = width * 2 // 3 + (i % 24) * 24, height // 2 + (i // 24) * 24
        colour = f"#{rng.randrange(1 << 24):06x}"
        canvas.create_rectangle(x, y, x + 24, y + 24, fill=colour, outline="")
    root.mainloop()


if __name__ == "__main__":
    main()
