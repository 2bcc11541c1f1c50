"""The leases table: which gateway process owns which stream, when several share a log.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``leases``, keyed by the resource leased (a stream, or a member itself)."""
    op.create_table(
        "leases",
        sa.Column("resource", sa.String(300), primary_key=True),
        sa.Column("owner", sa.String(300), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    """Drop ``leases`` (who owned what; the log itself is untouched)."""
    op.drop_table("leases")
