"""The composition root: settings, the Faust app, local services and the command line."""
