from rlrun.cli.app import app

app()
