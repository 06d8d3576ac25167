"""``mpmd profiles``: the bundled device profiles, as a table."""

from __future__ import annotations

import click

from mpmd.cli.common import console, guard


@click.command()
@guard
def profiles() -> None:
    """List the bundled device profiles and their matmul rates by precision."""
    from hardware_profiles import precision_table, profiles_table, recipe_table

    console.print(profiles_table())
    console.print(precision_table())
    console.print(recipe_table())
