import os

# Token authentication stays on for the Ray the instruments start (feeding, pipeline, scale): Ray
# reads RAY_AUTH_MODE once, on import, so it is set before anything imports Ray.
os.environ.setdefault("RAY_AUTH_MODE", "token")

from lab.cli import main  # noqa: E402

main()
