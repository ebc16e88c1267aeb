"""`python ops/compose/env_file.py [.env]`: the Compose stack's secrets, generated or refused.

`make up STACK=docker` runs it before Compose. A missing `.env` is written with a random secret for
every key (mode 0600, `credentials.ensure_credentials`); keys a newer version added are generated into
an existing one. A placeholder (`change-me...`, as in .env.example) or empty value is refused with a
message saying how to set it: nothing starts with a default password.
"""
from __future__ import annotations

import secrets
import sys
from pathlib import Path

from pipeline_core import credentials

# Secrets only Compose needs, generated with the others: the Spark standalone cluster's shared RPC secret.
COMPOSE_SECRETS = ("SPARK_AUTHENTICATE_SECRET",)


class PlaceholderError(RuntimeError):
    pass


def placeholder_keys(values: dict[str, str]) -> list[str]:
    """Keys present in the file whose value is a placeholder or empty (missing keys get generated)."""
    checked = [*credentials.password_keys(), *COMPOSE_SECRETS]
    return sorted(key for key in checked
                  if key in values and (not values[key] or credentials.PLACEHOLDER_MARK in values[key]))


def refusal(path: Path, keys: list[str]) -> str:
    return (f"{path} holds placeholder or empty secrets: {', '.join(keys)}.\n"
            f"Give each a secret of its own in {path}, for example the output of\n"
            "  python3 -c 'import secrets; print(secrets.token_urlsafe(32))'\n"
            f"or delete those lines (or the whole file on a stack never started) and run `make up` again:\n"
            "it generates every missing secret at random.")


def ensure_env_file(path: Path) -> dict[str, str]:
    """The Compose `.env` with every secret set; raises PlaceholderError naming the keys to set."""
    keys = placeholder_keys(credentials.read_credentials(path))
    if keys:
        raise PlaceholderError(refusal(path, keys))
    existing = credentials.read_credentials(path)
    extra = {key: secrets.token_urlsafe(credentials.PASSWORD_BYTES) for key in COMPOSE_SECRETS
             if not existing.get(key)}
    return credentials.ensure_credentials(path=path, extra=extra)


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else ".env")
    created = not path.exists()
    try:
        ensure_env_file(path)
    except PlaceholderError as error:
        print(f"make up refused: {error}", file=sys.stderr)
        return 1
    if created:
        print(f"generated {path} with a random secret for every server account (docs/security.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
