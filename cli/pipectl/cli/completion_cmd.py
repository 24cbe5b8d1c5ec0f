"""``pipectl completion bash|zsh|fish``: print click's own completion script for the shell.

The same script as ``_PIPECTL_COMPLETE=bash_source pipectl`` (click docs, "Shell Completion");
the script calls pipectl back with ``_PIPECTL_COMPLETE=bash_complete`` at each <TAB>, so commands,
options and choices (pipelines, lanes, launchers, output formats) complete from the installed
pipectl itself. Install (bash): ``pipectl completion bash > ~/.local/share/bash-completion/completions/pipectl``
or ``eval "$(pipectl completion bash)"`` in ~/.bashrc.
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

SHELLS = ("bash", "zsh", "fish")
PROG_NAME = "pipectl"
COMPLETE_VAR = "_PIPECTL_COMPLETE"
"""click's variable for a program named pipectl: ``_{PROG_NAME}_COMPLETE`` upper-cased."""


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for SHELL (bash, zsh, fish) on stdout.

    \b
    bash:  eval "$(pipectl completion bash)"           (in ~/.bashrc)
    zsh:   eval "$(pipectl completion zsh)"            (in ~/.zshrc)
    fish:  pipectl completion fish > ~/.config/fish/completions/pipectl.fish
    """
    cls = get_completion_class(shell)
    assert cls is not None  # every name in SHELLS is one of click's built-in shells
    click.echo(cls(ctx.find_root().command, {}, PROG_NAME, COMPLETE_VAR).source())
