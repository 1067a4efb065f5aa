"""Small helpers shared by the scripts: one-line CLI errors (``cli_errors``) and the glibc
allocator settings (``cpu_allocator``)."""
