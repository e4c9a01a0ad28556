"""A tqdm progress bar for management commands, shown only on a terminal."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import NoReturn

from django.core.management.base import OutputWrapper
from tqdm import tqdm


def _plain(text: str) -> str:
    return text


class _RawWriter:
    """Writes tqdm's output as is: no added line ending, no error colour."""

    def __init__(self, out: OutputWrapper) -> None:
        self._out = out

    def write(self, text: str) -> None:
        self._out.write(text, style_func=_plain, ending="")

    def flush(self) -> None:
        self._out.flush()


class Progress:
    """A progress bar on ``stream`` (a command's ``self.stderr``), disabled unless it is a TTY.

    Use it as a context manager; write other output inside ``paused()`` so that it does not tear the bar.
    """

    def __init__(
        self, *, total: int, desc: str, stream: OutputWrapper, enabled: bool = True, unit: str = "job"
    ) -> None:
        self.enabled = enabled and stream.isatty()
        self._bar: tqdm[NoReturn] = tqdm(
            total=total, desc=desc, unit=unit, file=_RawWriter(stream), disable=not self.enabled, dynamic_ncols=True
        )

    def update(self, count: int = 1) -> None:
        """Advance the bar by ``count``."""
        self._bar.update(count)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Clear the bar while other output is written, then redraw it."""
        if not self.enabled:
            yield
            return
        self._bar.clear()
        try:
            yield
        finally:
            self._bar.refresh()

    def close(self) -> None:
        """Finish the bar; later ``paused()`` blocks just run."""
        self._bar.close()
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
