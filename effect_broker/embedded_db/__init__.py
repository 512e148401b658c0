"""Django database backend that starts the embedded PostgreSQL server on first use."""
