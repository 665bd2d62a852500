from rlrun.cli import app

app()
