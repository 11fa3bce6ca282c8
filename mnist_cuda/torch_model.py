"""docs/design.md's network in torch.nn, for the comparison script and the reference's cross-check.

The module and parameter names equal our state_dict's, so `load_state_dict` takes our checkpoints.
torch is imported only when this is called (it is an optional extra).
"""


def make_torch_model(channels=(32, 64), hidden=128):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    c1, c2 = channels

    class MnistCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, c1, 3, padding=1, bias=False)  # BN's shift makes a bias redundant
            self.bn1 = nn.BatchNorm2d(c1)
            self.conv2 = nn.Conv2d(c1, c2, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c2)
            self.fc1 = nn.Linear(c2 * 49, hidden)
            self.fc2 = nn.Linear(hidden, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
            x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
            x = F.relu(self.fc1(torch.flatten(x, 1)))
            return F.log_softmax(self.fc2(x), dim=1)

    return MnistCNN()
