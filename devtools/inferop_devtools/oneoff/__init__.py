"""Scripts behind one-off figures the README quotes with their date: run by hand, not by any make target."""
