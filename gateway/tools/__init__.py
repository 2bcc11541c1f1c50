"""Tools for people: the replay debugger, export and import, quarantine, the demo, timeline
wording, terminal reports and progress bars."""
