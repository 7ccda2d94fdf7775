"""The staging kernels: a step's small host inputs brought to their device views, padded on
the device, and the helpers through which kernels read a step's counts."""
