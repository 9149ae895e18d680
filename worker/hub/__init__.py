"""The reference hub: the server side of `WorkerService.Stream`, its store, and the
`ControlService` client callers use. It speaks the wire and never imports the worker side."""
