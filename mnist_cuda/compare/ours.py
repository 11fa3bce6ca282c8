"""Our side of the comparison: a net of ours at one batch size, driven by mnist_cuda.step.Step."""

from __future__ import annotations

from ..nets import Parameters, make_net
from ..step import Step


class OurSide:
    """Our net at one batch size, driven by mnist_cuda.step.Step (the trainer's step runner, with its own
    stream). Modes are Step's: "eager", "graph", and "phases" (a CUDA graph per phase)."""

    name = "ours"

    def __init__(self, state, batch, optimizer, version, channels, hidden, precision="fp32"):
        """optimizer: a learning rate (plain SGD) or optim.SGDOptions."""
        self.params = Parameters(channels, hidden)
        self.params.load_state_dict(state)
        self.cp = self.params.cp
        self.runner = Step(make_net(self.params, batch, version, precision), optimizer)
        self.batch = batch

    def new_event(self):
        return self.cp.cuda.Event()

    def event(self):
        ev = self.new_event()
        ev.record(self.runner.stream)
        return ev

    def elapsed_ms(self, a, b):
        return self.cp.cuda.get_elapsed_time(a, b)

    def synchronize(self):
        self.runner.synchronize()

    def step(self, x, y, idx, mode, phase_events=None, next_idx=None):
        """One step on the samples idx. In graph mode the step graph also loads the next step's samples,
        next_idx, where given; the other modes load each batch in their step."""
        self.runner.run(x, y, idx, next_idx, mode=mode, events=phase_events)

    def losses(self):
        return self.runner.losses(reset=True)

    def state_dict(self):
        return self.params.state_dict()
