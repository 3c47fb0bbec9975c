"""``login`` and ``logout``: the stored token, or the stored value of a credential route."""

from __future__ import annotations

import sys

import click


def login(name: str | None, from_stdin: bool) -> None:
    """Store the token (with ``name``: credential route ``name``'s value; ``proxy``: the upstream proxy's
    password), read from standard input when ``from_stdin`` or no terminal, else asked for without echo."""
    from claude_bottle import tokens
    from claude_bottle.credentials import Credential

    what = "Upstream proxy's password" if name == tokens.PROXY_NAME else \
        f"Value for credential {name}" if name else "Token (from `claude setup-token`)"
    text = sys.stdin.read() if from_stdin or not sys.stdin.isatty() else click.prompt(what, hide_input=True)
    if name == tokens.PROXY_NAME:
        where = tokens.store_proxy_password(text)
    else:
        where = tokens.store_route(name, text) if name else tokens.store(Credential.parse(text, "the token given"))
    click.echo(f"stored in {where}")


def logout(name: str | None) -> None:
    """Forget the stored token (with ``name``: credential route ``name``'s stored value) wherever it is."""
    from claude_bottle import tokens

    if name:
        removed = tokens.remove_proxy_password() if name == tokens.PROXY_NAME else tokens.remove_route(name)
        click.echo(f"removed from {', '.join(removed)}" if removed else f"no stored value for {name}")
        return

    removed = tokens.remove()
    click.echo(f"removed from {', '.join(removed)}" if removed else "no stored token")
