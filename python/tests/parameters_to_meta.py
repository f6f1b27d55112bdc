"""A module with its parameters on the meta device and its buffers real, as
accelerate.init_empty_weights() builds one, for the tests of modules built without their weights."""

import torch


def parameters_to_meta(module):
    """What accelerate.init_empty_weights() leaves: parameters on the meta device (ties kept),
    buffers real."""
    moved = {}
    for submodule in module.modules():
        for name, parameter in list(submodule._parameters.items()):
            if parameter is None:
                continue
            if id(parameter) not in moved:
                moved[id(parameter)] = torch.nn.Parameter(parameter.to("meta"),
                                                          requires_grad=False)
            submodule._parameters[name] = moved[id(parameter)]
    return module
