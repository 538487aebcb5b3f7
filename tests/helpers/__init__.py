"""What tests share: imported from here, never from another test module or a conftest."""
