import atexit
import os
import shutil
import tempfile

# Real redis-server and Redis Cluster processes, as fixtures for any test that names them;
# and the Unix clock pinned to virtual time while a virtual loop runs (every test).
pytest_plugins = ["tests.support.redis_server", "tests.support.redis_cluster", "tests.support.unix_clock"]

# A run that names no graveyard and writes no report puts it under the XDG state
# directory: the tests' runs (and their child processes) use one of their own.
os.environ["XDG_STATE_HOME"] = _STATE = tempfile.mkdtemp(prefix="ratedeck-state-")
# Gone when the session ends (each xdist worker has its own), not left in /tmp run after run.
atexit.register(shutil.rmtree, _STATE, ignore_errors=True)
