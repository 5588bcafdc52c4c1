"""lunasol: root causes and single-lever proposals from frozen agent-harness bundles.

Importing this package never touches the network (see :mod:`pipeline.core.offline`).
"""

from pipeline.core import offline as _offline

_offline.apply()

__version__ = "0.1.0"

SCHEMA_VERSION = 1
"""Version of every JSON artifact and of the IR; bump with a numbered migration."""
