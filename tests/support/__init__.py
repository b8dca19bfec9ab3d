"""What the tests share: engines on a virtual clock, console fixtures, hostile servers, real redis-server processes, the docs' commands."""
