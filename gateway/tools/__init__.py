"""Tools for people: the replay debugger, export and import, the demo, timeline wording,
terminal reports and progress bars."""
