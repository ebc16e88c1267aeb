"""`python -m soak` (`make soak`): a plant's week through the whole running pipeline, with faults, verdicts at the
end (exit status 0 only if all hold) and a report under reports/."""
from __future__ import annotations

import sys

from pipeline_core.logs import configure_logging
from pipeline_core.settings import load_settings

from .run import Soak
from .settings import SoakSettings


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(SoakSettings, argv, prog="python -m soak")
    configure_logging()
    return Soak(settings).run()


if __name__ == "__main__":
    sys.exit(main())
