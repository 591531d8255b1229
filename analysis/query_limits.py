"""The time limit of user SQL: here, apart from analysis.query, so the CLI can show it in
``--help`` without importing duckdb and pyarrow."""

DEFAULT_TIMEOUT_S = 60.0
"""Time limit of one user query, in seconds (``qparity sql --timeout``)."""
TIMEOUT_ENV = "QPARITY_SQL_TIMEOUT"
"""Environment variable that sets the time limit of ``qparity sql``."""
