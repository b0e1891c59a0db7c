"""Activities: all I/O lives here, one file per kind of side effect."""
