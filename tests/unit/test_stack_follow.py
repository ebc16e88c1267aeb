"""`make logs SERVICE=… FOLLOW=1`: the last lines of a log, then every line written to it, once each and in order,
across supervisord's rotation (the full log renamed to `<log>.1`, a new one started) and a truncation."""
from __future__ import annotations

import io
import os
import threading
from pathlib import Path

from stack.processes import follow
from support import wait_for


class Output(io.StringIO):
    """What the follower wrote, read from the test's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)

    def text(self) -> str:
        with self.lock:
            return self.getvalue()


def append(path: Path, *lines: str) -> None:
    with open(path, "a") as log:
        log.write("".join(line + "\n" for line in lines))


def test_follow_prints_the_last_lines_then_every_new_line_across_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "stage.log"
    append(log, *(f"old {n}" for n in range(10)))
    out, stop = Output(), threading.Event()
    follower = threading.Thread(target=follow, args=(log, 3, out), kwargs={"interval_s": 0.02,
                                                                          "should_stop": stop.is_set})
    follower.start()
    try:
        wait_for(lambda: out.text() == "old 7\nold 8\nold 9\n", 10, "the last three lines")
        append(log, "new 1", "new 2")
        wait_for(lambda: out.text().endswith("new 2\n"), 10, "the lines written since")
        # supervisord's rotation: the last lines go to the old file, which is renamed, then a new file begins.
        append(log, "before rotation")
        os.rename(log, log.with_name("stage.log.1"))
        append(log, "after rotation 1", "after rotation 2")
        wait_for(lambda: out.text().endswith("after rotation 2\n"), 10, "the new log's lines")
        log.write_text("")  # truncated
        append(log, "after truncation")
        wait_for(lambda: out.text().endswith("after truncation\n"), 10, "the truncated log's new line")
    finally:
        stop.set()
        follower.join(10)
    assert not follower.is_alive()
    assert out.text().splitlines() == ["old 7", "old 8", "old 9", "new 1", "new 2", "before rotation",
                                       "after rotation 1", "after rotation 2", "after truncation"]


def test_follow_waits_for_a_log_not_written_yet(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    out, stop = Output(), threading.Event()
    follower = threading.Thread(target=follow, args=(log, 5, out), kwargs={"interval_s": 0.02,
                                                                          "should_stop": stop.is_set})
    follower.start()
    try:
        append(log, "first line")
        wait_for(lambda: out.text() == "first line\n", 10, "the first line of a new log")
    finally:
        stop.set()
        follower.join(10)
