"""What several test modules share: helpers, fixtures and the child programs tests start."""
