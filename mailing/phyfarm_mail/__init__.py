"""phyfarm on a mailing list: follow a public-inbox archive, run new series
revisions, count maintainers' pw-bot replies, send report mails."""
