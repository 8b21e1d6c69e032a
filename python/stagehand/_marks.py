"""What the trainer callbacks share: marks that can be told to stay quiet."""

from . import Phase, _lib, loaded, mark_phase, step


class Marks:
    """Step and phase marks for a trainer callback.

    required=True (the default) fails at once, when the callback is made, if
    the library is not loaded: a run meant to be managed should not go
    unmanaged unnoticed. required=False makes the marks do nothing then, for
    a script that runs both ways.
    """

    def __init__(self, required=True):
        if required:
            _lib.handle()  # NotLoadedError, saying how to load it
        self.on = loaded()

    def step(self):
        if self.on:
            step()
            mark_phase(Phase.FORWARD)  # a step's work begins with its forward pass

    def phase(self, p):
        if self.on:
            mark_phase(p)
