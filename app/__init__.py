"""The cka-atlas service: CLI, settings, database, jobs, REST API and web page."""
