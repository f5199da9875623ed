"""What people see: the snapshot, status.json, the panel, the texts they share."""
