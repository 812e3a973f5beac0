"""The pure core of costline: events, prices and rules. No sockets, no Faust, no Redis client."""
