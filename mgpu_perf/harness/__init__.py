"""What the harness times: training sessions, a user's model, rank pools, collective peers."""
