"""The dashboard (`orchard tui`): runs, metrics, sandboxes and trajectories, read through the store's
read model (`orchard.store.views`); sandboxes are deleted through the service or a manager."""
