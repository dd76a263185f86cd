"""Device-plugin mode (`python -m deviceplugin`): kubelet's device-plugin API v1beta1.

`daemon` (this mode's steps of the shared start, deviceplugin/daemon.py), `mode` (its entry in
the one start path, deviceplugin/startup.py), `server` (the gRPC server on its socket in kubelet's folder), `service` (the DevicePlugin and
Status servicers), `requests` (kubelet's IDs <-> GPU indices), `registration` (Register, and the
folder watch that survives kubelet restarts), `api` (what those share), `status_client`
(`gputopo status`)."""
