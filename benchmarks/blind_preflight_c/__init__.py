"""Set c: a further blind preflight evaluation set (see README.md)."""
