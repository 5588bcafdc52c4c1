"""lunasol: root causes and single-lever proposals from frozen agent-harness bundles.

Importing this package changes nothing: the offline switches (:mod:`pipeline.core.offline`) are
applied by the CLI entry point and the test plugin, before anything imports litellm.
"""

__version__ = "0.1.0"
