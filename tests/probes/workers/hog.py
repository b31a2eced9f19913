"""Test worker: burns CPU until killed. argv: TAG."""
while True:
    pass
