"""``admission passwd USER``: a line for the embedded server's users file, with the password
stored as a SCRAM-SHA-256 verifier (as PostgreSQL stores it), never in clear."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import fail


def passwd(
    user: Annotated[str, typer.Argument(help="The user name clients will connect as.")],
) -> None:
    """Print a users-file line for USER (asks for the password twice, not echoed).

    Append it to the file given to `admission serve --users FILE`.
    """
    from proxy.backends.embedded.auth import verifier

    password = typer.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    if not password:
        raise fail("the password is empty")
    if '"' in user:
        raise fail('a user name in the users file cannot hold a double quote (")')
    typer.echo(f'"{user}" "{verifier(password)}"')
